// Package logkeys holds the structured-logging keys used across Ephemera, in the
// lowerCamelCase style of the Kubernetes structured logging guide. It has no
// types: its constants are the keys.
package logkeys
