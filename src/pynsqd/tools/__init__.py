"""NSQ's command-line tools, with the Go tools' flags and output: ``nsq_tail``, ``to_nsq``."""
