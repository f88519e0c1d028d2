//go:build !linux

package k8stest

import "syscall"

func setPdeathsig(*syscall.SysProcAttr) {}
