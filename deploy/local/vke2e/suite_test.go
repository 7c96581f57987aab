//go:build e2e

// Package vke2e runs virtual-kubelet's end-to-end suite (test/e2e of the pinned module) against one
// node. It is the upstream suite's own entry point with two things the upstream mock provider's
// main_test.go hard-codes made flags: the watch timeout, and a regular expression of the suite's
// tests to skip (a provider says which of them its node cannot serve, and why, where it calls this
// binary). Nothing of the suite itself is changed.
package vke2e

import (
	"flag"
	"regexp"
	"testing"
	"time"

	vke2e "github.com/virtual-kubelet/virtual-kubelet/test/e2e"
)

var (
	kubeconfig   = flag.String("kubeconfig", "", "kubeconfig of the cluster the node belongs to")
	namespace    = flag.String("namespace", "default", "namespace the suite creates its pods in")
	nodeName     = flag.String("node-name", "", "the virtual node under test")
	watchTimeout = flag.Duration("watch-timeout", 2*time.Minute, "how long each of the suite's waits may take")
	skip         = flag.String("skip-tests", "", "regular expression of the suite's test names to skip")
)

func TestEndToEnd(t *testing.T) {
	var skipped *regexp.Regexp
	if *skip != "" {
		skipped = regexp.MustCompile(*skip)
	}
	suite := vke2e.NewEndToEndTestSuite(vke2e.EndToEndTestSuiteConfig{
		Kubeconfig:   *kubeconfig,
		Namespace:    *namespace,
		NodeName:     *nodeName,
		WatchTimeout: *watchTimeout,
		ShouldSkipTest: func(name string) bool {
			return skipped != nil && skipped.MatchString(name)
		},
	})
	suite.Run(t)
}
