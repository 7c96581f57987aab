//go:build tools

// Package tools pins JobSet's controller manager (the main package at the root of
// sigs.k8s.io/jobset) in this module's go.mod and go.sum.
package tools

import _ "sigs.k8s.io/jobset"
