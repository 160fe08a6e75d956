// Command etcd is etcd v3 built from the Go module graph of k8s.io/kubernetes.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
