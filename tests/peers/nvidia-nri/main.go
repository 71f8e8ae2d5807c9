// Command nvidia-nri runs NVIDIA's NRI plugin (nvidia-container-toolkit's
// cmd/nvidia-ctk-installer/container/runtime/nri, the plugin nvidia-ctk-installer starts
// with --enable-nri-plugin) on its own, for tests/containerd_nri.rs: the same code, without
// the installer's toolkit install and runtime configuration around it. It injects the CDI
// devices a pod names in its `nvidia.cdi.k8s.io/*` annotations and allocates nothing.
//
//	nvidia-nri -socket PATH [-index 10]
//
// It logs to stderr and runs until SIGTERM or SIGINT.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk-installer/container/runtime/nri"
)

// stderrLogger is the logger the plugin takes (the toolkit's logger.Interface, which is
// internal to its module: any value with these methods is one).
type stderrLogger struct{}

func (stderrLogger) Debugf(f string, a ...interface{})   { log.Printf("debug: "+f, a...) }
func (stderrLogger) Infof(f string, a ...interface{})    { log.Printf("info: "+f, a...) }
func (stderrLogger) Warningf(f string, a ...interface{}) { log.Printf("warning: "+f, a...) }
func (stderrLogger) Errorf(f string, a ...interface{})   { log.Printf("error: "+f, a...) }
func (stderrLogger) Tracef(f string, a ...interface{})   { log.Printf("trace: "+f, a...) }

func main() {
	socket := flag.String("socket", "/var/run/nri/nri.sock", "the runtime's NRI socket")
	// The installer's default (--nri-plugin-index).
	index := flag.Int("index", 10, "the plugin's index: lower indexes are called first")
	// The installer's default namespace for management CDI devices.
	namespace := flag.String("namespace", "gpu-operator", "namespace allowed management CDI devices")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	plugin := nri.NewPlugin(ctx, stderrLogger{}, []string{*namespace})
	if err := plugin.Start(ctx, *socket, fmt.Sprintf("%02d", *index)); err != nil {
		log.Fatalf("nvidia-nri: %v", err)
	}
	log.Printf("nvidia-nri: registered on %s with index %02d", *socket, *index)
	<-ctx.Done()
	plugin.Stop()
}
