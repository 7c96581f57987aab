package main

// The dra-publisher applet: a Dynamic Resource Allocation (resource.k8s.io/v1) device publisher for
// kwok GPU nodes, doing what a real DRA driver's kubelet plugin does for its node's ResourceSlices.
//
// It owns the ResourceSlices of one driver (--config's "driver", gpu.nvidia.com in the local
// environment) on the nodes named in --config, and nothing else: one upstream
// k8s.io/dynamic-resource-allocation/resourceslice controller per node, all in this one process,
// each owned by its Node (APIVersion v1, Kind Node, name and UID read from the API), so every slice
// carries spec.nodeName and is garbage-collected with its node. The devices (names, attributes,
// capacities) are the config's, written by gpufed/localenv/dra.py; this applet adds nothing.
//
// It waits (retrying) for each Node to exist, publishes, logs to stderr and exits 0 on SIGTERM or
// SIGINT, leaving the slices in place (a restart adopts them; the node's deletion removes them).
// It does not prepare devices for containers: kwok has no kubelet, so claims are allocated by the
// scheduler and never prepared.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// draConfig is the --config file: one driver, the nodes it publishes devices for.
type draConfig struct {
	Driver string    `json:"driver"`
	Nodes  []draNode `json:"nodes"`
}

type draNode struct {
	Name    string      `json:"name"`
	Devices []draDevice `json:"devices"`
}

// draDevice is a resource.k8s.io/v1 Device with capacities written as plain quantities.
type draDevice struct {
	Name       string                                                    `json:"name"`
	Attributes map[resourceapi.QualifiedName]resourceapi.DeviceAttribute `json:"attributes"`
	Capacity   map[resourceapi.QualifiedName]resource.Quantity           `json:"capacity"`
}

// draNodeRetry is how often a node that does not exist yet (or an API error) is retried.
const draNodeRetry = time.Second

func runDRAPublisher(args []string) int {
	fs := flag.NewFlagSet("dra-publisher", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster (required)")
	configPath := fs.String("config", "", "JSON file: {driver, nodes: [{name, devices}]} (required)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *kubeconfig == "" || *configPath == "" {
		fmt.Fprintln(os.Stderr, "dra-publisher: --kubeconfig and --config are required")
		return 2
	}
	raw, err := os.ReadFile(*configPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dra-publisher: %v\n", err)
		return 1
	}
	var cfg draConfig
	if err := json.Unmarshal(raw, &cfg); err != nil || cfg.Driver == "" {
		fmt.Fprintf(os.Stderr, "dra-publisher: %s is not a publisher config (driver, nodes): %v\n", *configPath, err)
		return 2
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dra-publisher: %v\n", err)
		return 1
	}
	restCfg.UserAgent = "gpufed-dra-publisher"
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dra-publisher: %v\n", err)
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger := klog.Background().WithName("dra-publisher")
	ctx = klog.NewContext(ctx, logger)
	logger.Info("starting", "driver", cfg.Driver, "nodes", len(cfg.Nodes))

	var (
		mu          sync.Mutex
		controllers []*resourceslice.Controller
		wg          sync.WaitGroup
	)
	for _, n := range cfg.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := publish(ctx, cs, cfg.Driver, n)
			if c != nil {
				mu.Lock()
				controllers = append(controllers, c)
				mu.Unlock()
			}
		}()
	}
	<-ctx.Done()
	wg.Wait()
	for _, c := range controllers {
		c.Stop()
	}
	logger.Info("stopped")
	return 0
}

// publish waits until the node exists, then starts its ResourceSlice controller (nil if ctx ends first).
func publish(ctx context.Context, cs kubernetes.Interface, driver string, n draNode) *resourceslice.Controller {
	logger := klog.FromContext(ctx).WithValues("node", n.Name)
	var node *metav1.ObjectMeta
	for node == nil {
		got, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil {
			node = &got.ObjectMeta
			break
		}
		logger.V(1).Info("waiting for node", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(draNodeRetry):
		}
	}
	devices := make([]resourceapi.Device, 0, len(n.Devices))
	for _, d := range n.Devices {
		capacity := make(map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, len(d.Capacity))
		for k, v := range d.Capacity {
			capacity[k] = resourceapi.DeviceCapacity{Value: v}
		}
		devices = append(devices, resourceapi.Device{Name: d.Name, Attributes: d.Attributes, Capacity: capacity})
	}
	// Without a pool name the slices' pool is named after the node, as kubelet plugins do.
	resources := &resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{n.Name: {Slices: []resourceslice.Slice{{Devices: devices}}}},
	}
	c, err := resourceslice.StartController(klog.NewContext(ctx, logger), resourceslice.Options{
		DriverName: driver,
		KubeClient: cs,
		Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID},
		Resources:  resources,
		ErrorHandler: func(ctx context.Context, err error, msg string) {
			klog.FromContext(ctx).Error(err, msg, "node", n.Name)
		},
	})
	if err != nil {
		logger.Error(err, "cannot start the ResourceSlice controller")
		return nil
	}
	logger.Info("publishing", "devices", len(devices), "uid", node.UID)
	return c
}
