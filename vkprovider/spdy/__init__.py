"""SPDY/3.1, written by hand because no maintained Python library speaks it: the session over one byte
stream (`session`)."""
