package credentials

// ValidKey reports whether key is a valid environment variable name:
// [A-Za-z_][A-Za-z0-9_]*. Only such credential keys reach a sandbox.
func ValidKey(key string) bool {
	if key == "" {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
