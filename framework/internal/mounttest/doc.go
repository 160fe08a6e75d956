// Package mounttest mounts what tests of the content writes need, for real,
// and unmounts it when the test ends: Busy makes a directory impossible to
// remove (a bind mount on it), Tmpfs mounts a tmpfs with the options given.
// They skip the test without root. Linux only.
package mounttest
