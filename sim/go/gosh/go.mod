// Builds gosh, the POSIX shell of mvdan.cc/sh, the `sh` of the sim's PyTorchJob init image (sim/pause.py): busybox's
// ash runs its own nslookup applet for a bare `nslookup`, whatever /bin holds.
module gpuyard.dev/sim/gosh

go 1.26.8

tool mvdan.cc/sh/v3/cmd/gosh

require (
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/term v0.45.0 // indirect
	mvdan.cc/sh/v3 v3.14.1 // indirect
)
