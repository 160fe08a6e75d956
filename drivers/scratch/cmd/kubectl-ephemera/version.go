package main

// version and commit are set by the Makefile's -ldflags (make release-plugins:
// -X main.version=... -X main.commit=...); "kubectl ephemera version" prints
// them (drivers/scratch/internal/buildinfo).
var (
	version = "dev"
	commit  string
)
