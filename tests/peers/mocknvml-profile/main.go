// Command mocknvml-profile prints what the mock libnvidia-ml serves for a profile, as
// JSON, straight from NVIDIA's mock server: what gpupin's tests compare gpupin's answers
// with.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"gpupin/tests/peers/profile"
)

type gpu struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	MemoryBytes uint64 `json:"memory_bytes"`
	PciBusID    string `json:"pci_bus_id"`
	Minor       int    `json:"minor"`
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintf(os.Stderr, "usage: mocknvml-profile PROFILE (one of %v)\n", profile.Names())
		os.Exit(2)
	}
	s, err := profile.New(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	out := struct {
		Driver string `json:"driver"`
		Nvml   string `json:"nvml"`
		Cuda   int    `json:"cuda"`
		Gpus   []gpu  `json:"gpus"`
	}{s.DriverVersion, s.NvmlVersion, s.CudaDriverVersion, nil}
	for _, d := range s.Devices {
		d := d.(*server.Device)
		out.Gpus = append(out.Gpus, gpu{d.Index, d.UUID, d.Config.Name, d.MemoryInfo.Total, d.PciBusID, d.Minor})
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		os.Exit(1)
	}
}
