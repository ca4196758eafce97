// The real node's sandbox ("pause") image: a static program that holds a pod's namespaces open
// and exits on SIGINT or SIGTERM. Built by hack/devcluster/node.py; no registry serves one here.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
}
