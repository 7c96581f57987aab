//go:build tools

// Package tools pins Kueue's manager in this module's go.mod and go.sum.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
