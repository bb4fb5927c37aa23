"""pynsqd: a wire-compatible NSQ nsqd written in Python."""

__version__ = "0.1.0"
#: The nsqd release whose protocol pynsqd speaks; clients gate features on it.
NSQD_VERSION = "1.3.0"
