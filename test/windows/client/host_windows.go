//go:build windows

package main

import (
	"fmt"
	"os/exec"
	"strings"

	"golang.org/x/sys/windows"
)

// volumeRoot checks that dir is the root of a volume of its own (a folder
// mount point), not a plain directory on the system volume.
func volumeRoot(dir string) error {
	p, err := windows.UTF16PtrFromString(strings.TrimRight(dir, `\`) + `\`)
	if err != nil {
		return err
	}
	buf := make([]uint16, 50)
	if err := windows.GetVolumeNameForVolumeMountPoint(p, &buf[0], uint32(len(buf))); err != nil {
		return fmt.Errorf("%s is not a volume mount point: %w", dir, err)
	}
	return nil
}

// detached checks with PowerShell (Storage module, present on every Windows
// Server) that no disk image of that path is attached.
func detached(file string) error {
	script := fmt.Sprintf(`@(Get-Disk | Where-Object { $_.Location -eq '%s' }).Count`, strings.ReplaceAll(file, "'", "''"))
	out, err := exec.Command("powershell.exe", "-NoProfile", "-NonInteractive", "-Command", script).CombinedOutput()
	if err != nil {
		return fmt.Errorf("Get-Disk: %v: %s", err, out)
	}
	if n := strings.TrimSpace(string(out)); n != "0" {
		return fmt.Errorf("%s disk(s) still backed by %s", n, file)
	}
	return nil
}
