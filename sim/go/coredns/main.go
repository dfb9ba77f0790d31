// CoreDNS with only the plugins the cluster DNS of `gpuyard sim --real-nodes` uses (sim/coredns.py's Corefile):
// upstream's main (coredns.go) imports core/plugin, every plugin and its cloud SDKs; CoreDNS keeps its full
// directive order (core/dnsserver/zdirectives.go) and serves the plugins that registered themselves here.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
