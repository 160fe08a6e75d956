// Package greeter holds the Go test of the greeter plugin, index.js: an
// Ephemera plugin written in JavaScript for Node.js (see README.md). The
// test starts it as its own process beside an in-process driver.
package greeter
