// Command gpufed-k8s is a multi-call binary for gpufed's local cluster environment.
//
// It links, from ONE pinned Kubernetes release, kube-apiserver, kube-controller-manager,
// kube-scheduler and kubectl, plus an embedded etcd (go.etcd.io/etcd/server/v3/embed at the
// version that release requires), kwok, and dra-publisher (dra.go: a DRA device publisher for kwok
// GPU nodes, built on k8s.io/dynamic-resource-allocation/resourceslice). Linking them into one binary costs one link instead of
// six and shares every common package on disk. The applet is chosen by the name the binary is
// invoked as (symlinks such as bin/kubectl -> gpufed-k8s) or by the first argument
// ("gpufed-k8s kubectl get nodes").
//
// It owns nothing but dispatch, the small etcd front-end and the DRA publisher's glue; all other
// behaviour is upstream's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata" // CronJob time-zone support, as upstream's mains import it

	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl auth plugins
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"

	kwokconfig "sigs.k8s.io/kwok/pkg/config"
	kwokcmd "sigs.k8s.io/kwok/pkg/kwok/cmd"
	kwoklog "sigs.k8s.io/kwok/pkg/log"
	kwoksignals "sigs.k8s.io/kwok/pkg/utils/signals"
)

var applets = map[string]func(args []string) int{
	"kube-apiserver": func(args []string) int {
		cmd := apiserver.NewAPIServerCommand()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	},
	"kube-controller-manager": func(args []string) int {
		cmd := controllermanager.NewControllerManagerCommand()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	},
	"kube-scheduler": func(args []string) int {
		cmd := scheduler.NewSchedulerCommand()
		cmd.SetArgs(args)
		return cli.Run(cmd)
	},
	"kubectl": runKubectl,
	"etcd":    runEtcd,
	"kwok":    runKwok,
	// dra-publisher: see dra.go.
	"dra-publisher": runDRAPublisher,
}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if _, ok := applets[name]; !ok {
		if len(args) == 0 {
			usage()
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	run, ok := applets[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "gpufed-k8s: unknown applet %q\n", name)
		usage()
		os.Exit(2)
	}
	// Upstream commands read os.Args for a few things (kubectl's verbosity, plugin handling).
	os.Args = append([]string{name}, args...)
	os.Exit(run(args))
}

func usage() {
	names := make([]string, 0, len(applets))
	for n := range applets {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: gpufed-k8s APPLET [args...]  (applets: %s)\n", strings.Join(names, ", "))
}

func runKubectl(args []string) int {
	_, _ = logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args))
	cmd := kubectlcmd.NewDefaultKubectlCommand()
	cmd.SetArgs(args)
	if err := cli.RunNoErrOutput(cmd); err != nil {
		kubectlutil.CheckErr(err)
		return 1
	}
	return 0
}

func runKwok(args []string) int {
	// Kubernetes packages linked into this binary register a non-bool --version flag on the global
	// pflag set at init; cobra would merge it into kwok's command and fail on every run. kwok is
	// the only applet running in this process, so it gets a clean global set.
	pflag.CommandLine = pflag.NewFlagSet("kwok", pflag.ExitOnError)
	flagset := pflag.NewFlagSet("global", pflag.ContinueOnError)
	flagset.ParseErrorsAllowlist.UnknownFlags = true
	flagset.Usage = func() {}
	// kwok's flag helpers read os.Args; it was set to [kwok, args...] in main.
	ctx := kwoksignals.SetupSignalContext()
	ctx, logger := kwoklog.InitFlags(ctx, flagset)
	ctx, err := kwokconfig.InitFlags(ctx, flagset)
	if err != nil {
		_, _ = os.Stderr.Write([]byte(flagset.FlagUsages()))
		logger.Error("Init config flags", "err", err)
		return 1
	}
	cmd := kwokcmd.NewCommand(ctx)
	cmd.PersistentFlags().AddFlagSet(flagset)
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(ctx); err != nil {
		logger.Error("Execute exit", "err", err)
		return 1
	}
	return 0
}

// runEtcd starts a single-member etcd through the embed package and serves until SIGTERM/SIGINT.
func runEtcd(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	name := fs.String("name", "default", "member name")
	dataDir := fs.String("data-dir", "", "data directory (required)")
	clientURL := fs.String("listen-client-urls", "http://127.0.0.1:2379", "client URL (one)")
	peerURL := fs.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL (one)")
	metricsURL := fs.String("listen-metrics-urls", "", "optional metrics URL")
	logLevel := fs.String("log-level", "warn", "debug, info, warn, error")
	quota := fs.Int64("quota-backend-bytes", 2<<30, "backend quota in bytes")
	noFsync := fs.Bool("unsafe-no-fsync", false, "disable fsync (test clusters only: data can be lost on a crash)")
	compactMode := fs.String("auto-compaction-mode", "periodic", "periodic or revision")
	compactRetention := fs.String("auto-compaction-retention", "0", "auto-compaction retention (0 disables)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	parse := func(flagName, raw string) (url.URL, error) {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return url.URL{}, fmt.Errorf("etcd: --%s %q is not a URL", flagName, raw)
		}
		return *u, nil
	}
	cu, err := parse("listen-client-urls", *clientURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	pu, err := parse("listen-peer-urls", *peerURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}

	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{cu}
	cfg.AdvertiseClientUrls = []url.URL{cu}
	cfg.ListenPeerUrls = []url.URL{pu}
	cfg.AdvertisePeerUrls = []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = *logLevel
	cfg.QuotaBackendBytes = *quota
	cfg.UnsafeNoFsync = *noFsync
	cfg.AutoCompactionMode = *compactMode
	cfg.AutoCompactionRetention = *compactRetention
	if *metricsURL != "" {
		mu, err := parse("listen-metrics-urls", *metricsURL)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		cfg.ListenMetricsUrls = []url.URL{mu}
	}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: start: %v\n", err)
		return 1
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: ready, serving clients on %s\n", cu.String())
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		fmt.Fprintln(os.Stderr, "etcd: not ready after 60s")
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	select {
	case <-ctx.Done():
		return 0
	case err := <-e.Err():
		if err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
			return 1
		}
		return 0
	}
}
