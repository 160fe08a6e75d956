package framework

import (
	"runtime"
)

var defaultKubeletRoot, defaultStateRoot = func() (string, string) {
	if runtime.GOOS == "windows" {
		return `C:\var\lib\kubelet`, `C:\var\lib\ephemera`
	}
	return "/var/lib/kubelet", "/var/lib/ephemera"
}()
