"""nsqlookupd: the directory service nsqd nodes register with and consumers query."""
