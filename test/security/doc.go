// Package security holds the tests that prove Ephemera's safety guarantees
// against a hostile or unlucky node: lost and damaged state, symbolic links
// and renames raced into the kubelet's directories, a replaced pods directory,
// hostile sizes and colliding volume handles, and a seeded random walk over
// all of them (the model test). docs/security.md lists each guarantee beside
// the test that proves it.
//
// The tests mount real filesystems and need Linux and root; they run in
// `make test` (and `make test-unit`) and are skipped elsewhere.
package security
