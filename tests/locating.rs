// locating: written next
