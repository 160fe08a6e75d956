// Package stamp keeps the identity of a driver's state store in a backend's
// storage directory (see framework.Stamper). A backend whose storage lives
// under one directory implements Stamper with Read and Write on that
// directory.
//
// The stamp says "the store with this identity has a record for every piece
// of storage in this directory, and creates the record before any new
// storage". A state file that is lost, reset or rebuilt gets a new identity,
// so the framework then adopts the storage it finds instead of deleting it.
package stamp
