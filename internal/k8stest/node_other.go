//go:build !linux

package k8stest

import (
	"context"
	"errors"
)

func nodePreflight() (string, error) { return "", errors.New("node mode runs on Linux only") }

func (c *Cluster) startNode(context.Context, string, string, [4]byte, int) error {
	return errors.New("node mode runs on Linux only")
}

func (n *Node) stop() {}
