// Command gpuallocator-bench times NVIDIA's go-gpuallocator BestEffort policy (the one
// NVIDIA's Kubernetes device plugin uses for GetPreferredAllocation) on gpupin's
// inventory files, for the side-by-side table of benches/policy.rs.
//
//	gpuallocator-bench [-timeout 60s] CASES
//
// CASES (a file, or - for stdin) holds one JSON object per line:
//
//	{"machine": "pcie8", "inventory": "/path/pcie8.json", "count": 2, "held": [3, 6]}
//
// where inventory is a file in gpupin's JSON inventory format (src/host/inventory/file.rs)
// with its `topology` matrix, and held are GPU indexes not available to the policy. For
// each case it prints one JSON line:
//
//	{"machine": "pcie8", "count": 2, "held": [3, 6], "ns_per_call": 5120.5, "calls": 4021, "chosen": [0, 1]}
//
// or, when the case ran past the timeout, "timed_out": true and "timeout_s" instead of
// the figures. Each case runs in a child process (this program again, with -case), so a
// case that times out is killed rather than left spinning beside the next one.
//
// The device list is built the way go-gpuallocator's NewDevices builds it from NVML, but
// from the file: one Device per GPU (Index is the GPU's index, as NVML enumerates them),
// and for each ordered pair the P2PLink types NVML would report, from the pair's
// `nvidia-smi topo -m` entry:
//
//	SYS  P2PLinkCrossCPU     NODE P2PLinkSameCPU     PHB P2PLinkHostBridge
//	PXB  P2PLinkMultiSwitch  PIX  P2PLinkSingleSwitch
//	NV<k> k NVLinks (SingleNVLINKLink .. EighteenNVLINKLinks)
//	NVS  EighteenNVLINKLinks
//
// The matrix has one entry per pair, as nvidia-smi prints it: an NVLinked pair's PCIe
// path is not in it, so such a pair gets only its NVLink entry (over NVML go-gpuallocator
// would add the PCIe level, at most 60 points beside at least 100 per NVLink). go-gpuallocator
// has no NVSwitch type (its links package leaves "Handle NVSwitch semantics" as a TODO:
// over NVML a GPU's NVLinks lead to the switch, not to a peer, so switch-connected pairs
// get no NVLink entry at all); NVS is given the most NVLinks it knows, which, like
// gpupin's table, ranks NVS above every NV<k>, and is what nvidia-smi prints (NV18) for
// HGX Hopper and Blackwell boards.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
)

type benchCase struct {
	Machine   string `json:"machine"`
	Inventory string `json:"inventory"`
	Count     int    `json:"count"`
	Held      []int  `json:"held"`
}

type result struct {
	Machine   string   `json:"machine"`
	Count     int      `json:"count"`
	Held      []int    `json:"held"`
	NsPerCall *float64 `json:"ns_per_call,omitempty"`
	Calls     int      `json:"calls,omitempty"`
	Chosen    []int    `json:"chosen,omitempty"`
	TimedOut  bool     `json:"timed_out,omitempty"`
	TimeoutS  float64  `json:"timeout_s,omitempty"`
}

// What gpupin's inventory format says that the device list needs; other keys are ignored.
type inventory struct {
	Gpus []struct {
		Index    int    `json:"index"`
		UUID     string `json:"uuid"`
		PciBusID string `json:"pci_bus_id"`
		NumaNode *uint  `json:"numa_node"`
	} `json:"gpus"`
	Topology [][]string `json:"topology"`
}

func main() {
	timeout := flag.Duration("timeout", 60*time.Second, "time limit of one case (its first call and the repeats)")
	one := flag.String("case", "", "run this one case (a JSON object) in this process: what the parent runs per case")
	flag.Parse()
	if *one != "" {
		if err := runCase(*one); err != nil {
			fail(err)
		}
		return
	}
	if flag.NArg() != 1 {
		fail(errors.New("usage: gpuallocator-bench [-timeout 60s] CASES (a file of JSON lines, or - for stdin)"))
	}
	if err := runAll(flag.Arg(0), *timeout); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "gpuallocator-bench: %v\n", err)
	os.Exit(1)
}

func runAll(path string, timeout time.Duration) error {
	var in io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	scan := bufio.NewScanner(in)
	scan.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; scan.Scan(); line++ {
		text := strings.TrimSpace(scan.Text())
		if text == "" {
			continue
		}
		var c benchCase
		if err := json.Unmarshal([]byte(text), &c); err != nil {
			return fmt.Errorf("%s line %d: %v: expected {\"machine\", \"inventory\", \"count\", \"held\"}", path, line, err)
		}
		out, err := runChild(self, text, timeout)
		if errors.Is(err, context.DeadlineExceeded) {
			out, _ = json.Marshal(result{Machine: c.Machine, Count: c.Count, Held: nonNil(c.Held), TimedOut: true, TimeoutS: timeout.Seconds()})
		} else if err != nil {
			return fmt.Errorf("%s line %d (%s, count %d): %v", path, line, c.Machine, c.Count, err)
		}
		fmt.Println(strings.TrimSpace(string(out)))
	}
	return scan.Err()
}

// runChild runs one case in a child process, killed at the timeout.
func runChild(self, text string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, "-case", text)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return out, err
}

func runCase(text string) error {
	var c benchCase
	if err := json.Unmarshal([]byte(text), &c); err != nil {
		return fmt.Errorf("case %s: %v", text, err)
	}
	devices, err := loadDevices(c.Inventory)
	if err != nil {
		return err
	}
	held := map[int]bool{}
	for _, h := range c.Held {
		held[h] = true
	}
	var available []*gpuallocator.Device
	for _, d := range devices {
		if !held[d.Index] {
			available = append(available, d)
		}
	}
	policy := gpuallocator.NewBestEffortPolicy()
	allocate := func() []*gpuallocator.Device { return policy.Allocate(available, nil, c.Count) }

	start := time.Now()
	chosen := allocate()
	first := time.Since(start)
	if len(chosen) != c.Count {
		return fmt.Errorf("%s count %d: BestEffort returned %d GPUs of %d available", c.Machine, c.Count, len(chosen), len(available))
	}
	ns, calls := measure(allocate, first)

	indexes := make([]int, 0, len(chosen))
	for _, d := range chosen {
		indexes = append(indexes, d.Index)
	}
	sort.Ints(indexes)
	out, err := json.Marshal(result{Machine: c.Machine, Count: c.Count, Held: nonNil(c.Held), NsPerCall: &ns, Calls: calls, Chosen: indexes})
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}

// measure times calls like benches/policy.rs's criterion settings: 10 samples of about
// 20 ms each, the median per call. A first call of a second or more is the figure itself
// (repeating it ten times would only make the run longer).
func measure(allocate func() []*gpuallocator.Device, first time.Duration) (float64, int) {
	if first >= time.Second {
		return float64(first.Nanoseconds()), 1
	}
	iters := 1
	if first > 0 {
		iters = int(20*time.Millisecond/first) + 1
	}
	// Warm-up, as criterion does: caches and the allocator's first garbage collections.
	for deadline := time.Now().Add(50 * time.Millisecond); time.Now().Before(deadline); {
		allocate()
	}
	samples := make([]float64, 10)
	for s := range samples {
		start := time.Now()
		for i := 0; i < iters; i++ {
			allocate()
		}
		samples[s] = float64(time.Since(start).Nanoseconds()) / float64(iters)
	}
	sort.Float64s(samples)
	return (samples[4] + samples[5]) / 2, 1 + len(samples)*iters
}

func nonNil(held []int) []int {
	if held == nil {
		return []int{}
	}
	return held
}

func loadDevices(path string) ([]*gpuallocator.Device, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var inv inventory
	if err := json.Unmarshal(text, &inv); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	n := len(inv.Gpus)
	if len(inv.Topology) != n {
		return nil, fmt.Errorf("%s: the topology matrix has %d rows for %d GPUs: the comparison needs each pair's link", path, len(inv.Topology), n)
	}
	devices := make([]*gpuallocator.Device, n)
	for i, g := range inv.Gpus {
		d := &gpuallocator.Device{Index: g.Index, Links: map[int][]gpuallocator.P2PLink{}}
		d.UUID = g.UUID
		d.PCI.BusID = g.PciBusID
		d.CPUAffinity = g.NumaNode
		devices[i] = d
	}
	for a := range n {
		if len(inv.Topology[a]) != n {
			return nil, fmt.Errorf("%s: topology row %d has %d entries for %d GPUs", path, a, len(inv.Topology[a]), n)
		}
		for b := range n {
			if a == b {
				continue
			}
			t, err := linkType(inv.Topology[a][b])
			if err != nil {
				return nil, fmt.Errorf("%s: topology[%d][%d]: %v", path, a, b, err)
			}
			link := gpuallocator.P2PLink{GPU: devices[b]}
			setType(&link.Type, t)
			devices[a].Links[devices[b].Index] = append(devices[a].Links[devices[b].Index], link)
		}
	}
	sort.Slice(devices, func(i, j int) bool { return devices[i].Index < devices[j].Index })
	return devices, nil
}

// The values of go-gpuallocator's links.P2PLinkType (internal/links/device.go, v0.5.0).
const (
	p2pLinkCrossCPU     = 1
	p2pLinkSameCPU      = 2
	p2pLinkHostBridge   = 3
	p2pLinkMultiSwitch  = 4
	p2pLinkSingleSwitch = 5
	singleNVLinkLink    = 7
	maxNVLinks          = 18
)

// linkType maps an `nvidia-smi topo -m` entry to go-gpuallocator's link type.
func linkType(entry string) (uint, error) {
	switch entry {
	case "SYS":
		return p2pLinkCrossCPU, nil
	case "NODE":
		return p2pLinkSameCPU, nil
	case "PHB":
		return p2pLinkHostBridge, nil
	case "PXB":
		return p2pLinkMultiSwitch, nil
	case "PIX":
		return p2pLinkSingleSwitch, nil
	case "NVS":
		return singleNVLinkLink + maxNVLinks - 1, nil
	}
	if k, err := strconv.Atoi(strings.TrimPrefix(entry, "NV")); err == nil && strings.HasPrefix(entry, "NV") && k >= 1 && k <= maxNVLinks {
		return singleNVLinkLink + uint(k) - 1, nil
	}
	return 0, fmt.Errorf("link %q: expected NVS, NV1..NV18, PIX, PXB, PHB, NODE or SYS", entry)
}

// setType stores a link type in go-gpuallocator's P2PLinkType, which lives in an
// internal package: the type parameter names it without importing it.
func setType[T ~uint](t *T, v uint) {
	*t = T(v)
}
