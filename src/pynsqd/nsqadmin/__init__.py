"""nsqadmin: a web UI and JSON API for a cluster of nsqd (pynsqd or Go) found through
nsqlookupd or given directly, with live charts kept in the browser."""
