"""Infrastructure shared by nsqd, nsqlookupd and the tools, with no nsqd-specific knowledge."""
