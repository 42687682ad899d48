// forwarding: written next
