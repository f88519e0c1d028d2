package lifecycle

import (
	"crypto/rand"
	"math/big"
)

var (
	petAdjectives = []string{"able", "bold", "brave", "calm", "clever", "cosmic", "eager", "fair", "fancy", "fast", "gentle", "glad", "happy", "jolly", "keen", "kind", "lively", "lucky", "merry", "mighty", "neat", "nice", "noble", "proud", "quick", "quiet", "rapid", "sharp", "shiny", "smart", "snowy", "solid", "sunny", "swift", "tidy", "vivid", "warm", "wise", "witty", "zesty"}
	petNouns      = []string{"ant", "bat", "bear", "bee", "cat", "crab", "crow", "deer", "dog", "duck", "eel", "elk", "fox", "frog", "goat", "hawk", "ibis", "lark", "lion", "lynx", "mole", "moth", "mule", "newt", "owl", "puma", "ram", "seal", "slug", "swan", "toad", "wasp", "wolf", "wren", "yak", "zebu"}
)

func pick(words []string) string {
	n, err := rand.Int(rand.Reader, big.NewInt(int64(len(words))))
	if err != nil {
		return words[0]
	}
	return words[n.Int64()]
}

// petname returns a readable name such as "brave-otter" that satisfies
// ValidateSandboxName (at most 19 characters).
func petname() string {
	for {
		name := pick(petAdjectives) + "-" + pick(petNouns)
		if len(name) <= MaxSandboxNameLen {
			return name
		}
	}
}
