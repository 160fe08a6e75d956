// Package httpserver runs the driver's small HTTP endpoint (metrics, health
// and /volumes): [Handler] routes it, [Health] answers /healthz and /readyz,
// [Start] binds before it returns a [Server], so the caller knows the
// address and a bad address fails startup, and the Server stops gracefully.
package httpserver
