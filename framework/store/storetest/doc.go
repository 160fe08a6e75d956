// Package storetest is the conformance suite every [store.Store] implementation
// must pass, in the spirit of testing/fstest.
//
// # Usage
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { return memstore.New() })
//	}
//
// Persistent stores also run [RunReopen], which closes the store and opens it again
// on the same directory.
package storetest
