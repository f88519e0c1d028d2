package docker

import (
	"sync"
	"testing"
)

func TestKeyedMutex(t *testing.T) {
	var k keyedMutex
	var wg sync.WaitGroup
	counters := map[string]*int{"a": new(int), "b": new(int)}
	for range 50 {
		for key, c := range counters {
			wg.Go(func() {
				unlock := k.lock(key)
				v := *c // a lost update shows a broken exclusion (and -race flags it)
				*c = v + 1
				unlock()
			})
		}
	}
	wg.Wait()
	for key, c := range counters {
		if *c != 50 {
			t.Errorf("counter %s = %d, want 50", key, *c)
		}
	}
	if n := k.size(); n != 0 {
		t.Errorf("entries after every unlock = %d, want 0", n)
	}
}
