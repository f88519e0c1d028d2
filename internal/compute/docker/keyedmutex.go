package docker

import "sync"

// keyedMutex is a mutex per key whose entries live only while someone
// holds or waits for them, so locking by sandbox id and name does not grow
// without bound. The zero value is ready to use.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	mu    sync.Mutex
	users int // holders and waiters; guarded by keyedMutex.mu
}

// lock locks key and returns its unlock.
func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedEntry{}
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{}
		k.m[key] = e
	}
	e.users++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.users--; e.users == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

// size is the number of live entries (tests).
func (k *keyedMutex) size() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}
