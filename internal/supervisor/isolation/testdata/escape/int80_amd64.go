package main

// int80getpid calls getpid through the i386 syscall entry point.
func int80getpid() uintptr
