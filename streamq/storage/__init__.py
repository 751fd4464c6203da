"""The storage floor: the wire, the connection (standalone or cluster), the function
library and the contract each server-side function checks."""
