// Package sysloop lists the attached loop devices and their backing files
// from sysfs (/sys/block/loopN/loop/backing_file), as losetup -a does, for the
// tests that check nothing is left attached. A device whose backing file was
// deleted is listed with the file's former path.
package sysloop

import (
	"os"
	"path/filepath"
	"strings"
)

// Device is an attached loop device.
type Device struct {
	// Path is the device, /dev/loopN.
	Path string
	// BackingFile is the file it is bound to (its path before deletion).
	BackingFile string
}

// Where returns the attached loop devices whose backing file satisfies keep.
func Where(keep func(backingFile string) bool) []Device {
	paths, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []Device
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // detached meanwhile
		}
		file := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if keep(file) {
			out = append(out, Device{Path: "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(p))), BackingFile: file})
		}
	}
	return out
}

// Below returns the attached loop devices whose backing file is below dir.
func Below(dir string) []Device {
	return Where(func(f string) bool { return strings.HasPrefix(f, dir+"/") })
}
