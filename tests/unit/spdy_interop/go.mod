module gpufed.test/spdyinterop

go 1.26

require github.com/moby/spdystream v0.5.1
