// reentrancy: written next
