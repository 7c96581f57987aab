"""SPDY/3.1, written by hand because no maintained Python library speaks it: the frames, their encoding and
header compression (`frames`, pure), one stream as the application sees it (`stream`), and the session that
multiplexes streams over one byte stream with flow control (`session`)."""
