// Package csidriver checks the driver's CSIDriver object, the logic behind
// framework.CheckCSIDriver and the startup check of
// Options.Observability.CSIDrivers. Its core types are Problem, one way the
// object does not fit the driver (Check compares an object), and Startup,
// the check a driver runs once at startup (Startup.Run: read the object
// with retries, log, export and post what is wrong).
package csidriver
