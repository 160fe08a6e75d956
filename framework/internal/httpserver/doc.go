// Package httpserver runs the driver's small HTTP endpoint (metrics and
// health): [Start] binds before it returns a [Server], so the caller knows the
// address and a bad address fails startup, and the Server stops gracefully.
package httpserver
