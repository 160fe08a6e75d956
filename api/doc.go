// Package api holds Ephemera's public, stable types: the typed view of an ephemeral
// inline volume that backends receive ([Volume]), its attributes with validating
// getters ([Params]), redacted [Secrets], the kubelet's well-known volume_context
// keys, and the sentinel errors a backend returns.
//
// # Stability
//
// Types here change only in backward-compatible ways within a major version.
package api
