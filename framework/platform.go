package framework

import (
	"runtime"
)

// isWindows selects the Windows rules of the platform seam, the paths and
// the stats; the logic behind them lives in untagged files, tested on Linux.
var isWindows = runtime.GOOS == "windows"

// The defaults of Options.Node.KubeletRootDir and the root of Options.Node.StateDir.
var defaultKubeletRoot, defaultStateRoot = func() (string, string) {
	if runtime.GOOS == "windows" {
		return `C:\var\lib\kubelet`, `C:\var\lib\ephemera`
	}
	return "/var/lib/kubelet", "/var/lib/ephemera"
}()
