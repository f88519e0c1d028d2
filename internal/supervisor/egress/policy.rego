# The connection decision of the sandbox egress proxy (package egress).
#
# Evaluated once per connection (and per holder of the client socket) with
#   input: {"host": string, "port": number, "exe": string, "paths": {string},
#           "tails": [string]}
#     host as the client named it, exe the kernel-resolved executable of the
#     process holding the client socket ("" when unidentified), paths the set
#     of exe and its ancestors' executables (the caller's chain; "" for an
#     unidentified one). argv is never part of the input.
#     tails is a lookup aid built by Go from host: "" and the host's ends
#     from each of its dots, ".b.c" and ".c" for "a.b.c" (lower-cased, one
#     trailing dot removed, as host below): the keys under which the host
#     patterns that may match it are filed. Which of them match is decided
#     here; a missing tail would leave patterns untried (deny), never allow.
#   data.egress: the policy generation's network_policies in lookup form,
#     built by Go once per generation (engine.go):
#     "rules": one per rule, sorted by name:
#       [{"name": string, "exact_binaries": {path}, "glob_binaries": [pattern]}]
#     "ports": the endpoints by port (decimal string), as [rule index,
#       endpoint index] pairs:
#       {port: {"exact_hosts": {host: [[i, j]]},
#               "glob_hosts": {tail: {pattern: [[i, j]]}},
#               "any_host": [[i, j]]}}   host "*" or "**", or hostless
#     Hosts are lower-cased. A host or binary entry containing "*" is a
#     pattern; in it every glob meta character of glob.match but "*" is
#     escaped, so "*" and "**" are the only wildcards. A host pattern is
#     filed under its tail: its end from the dot after its last label
#     containing "*" (".example.com" for "*.example.com" and
#     "*.s3.*.example.com"), "" when that label is the last ("api.*"); a host
#     it matches ends with the tail. A hostless endpoint (allowed_ips, no
#     host) is listed under any_host, as it allows any host on its port; one
#     without allowed_ips is not listed.
#
# The result is data.openshell.egress.decision:
#   {"allow": true, "rule": index of the first allowing rule,
#    "matches": {[rule index, endpoint index], ...} of every allowing rule}
#   {"allow": false, "reason": string}
# Go applies what needs the network after it: DNS resolution once, the SSRF
# guard on the resolved addresses (allowed_ips of the matched endpoints), the
# pinned dial, and the REST request rules of the matched endpoints.
package openshell.egress

# One rule, its steps in local variables: each named rule or function
# costs the evaluator a cache entry and bindings of its own, about a
# quarter of a decision when the steps below were rules.
decision := verdict(matches, hits, rules) if {
	rules := data.egress.rules

	# The request host: case-insensitive, one trailing dot ignored.
	host := trim_suffix(lower(input.host), ".")

	# The endpoints listening on the requested port.
	on_port := object.get(data.egress.ports, format_int(input.port, 10), {})

	# The caller's executable and its ancestors'; an unidentified one ("")
	# is never matched.
	paths := input.paths - {""}

	# hits: the [rule index, endpoint index] pairs matching host and port.
	# Exact host; "*", "**" or no host (allowed_ips): every host; a
	# wildcard host with "." as separator: "*" matches within one DNS label
	# ("*.example.com", "*-aiplatform.googleapis.com", "*.s3.*.amazonaws.com"),
	# "**" across labels ("**.example.com"), tried only when filed under
	# one of the host's tails.
	hits := ({m | some m in on_port.exact_hosts[host]} | {m | some m in on_port.any_host}) | {m |
		some tail in input.tails
		some pattern, ms in on_port.glob_hosts[tail]
		glob.match(pattern, ["."], host)
		some m in ms
	}

	# The endpoints matching host and port in every rule allowing the
	# caller (one of the rule's binaries matches).
	matches := {m | some m in hits; binary_allowed(rules[m[0]], paths)}
}

# Binary matching: the executable or any ancestor, an exact path or a glob
# with "/" as separator ("/usr/bin/*" one directory level, "/**" all).
binary_allowed(rule, paths) if {
	count(rule.exact_binaries & paths) > 0
}

binary_allowed(rule, paths) if {
	some b in rule.glob_binaries
	some p in paths
	glob.match(b, ["/"], p)
}

# The allowing rule is the smallest index among the matches ([i, j] pairs
# order by i first). A denial names the first rule whose endpoint matched.
verdict(matches, hits, rules) := {"allow": true, "rule": min(matches)[0], "matches": matches} if {
	count(matches) > 0
} else := {"allow": false, "reason": "network connections not allowed by policy"} if {
	count(rules) == 0
} else := {"allow": false, "reason": sprintf("binary '%s' not allowed in policy '%s'", [input.exe, rules[min(hits)[0]].name])} if {
	count(hits) > 0
} else := {"allow": false, "reason": sprintf("endpoint %s:%d is not allowed by any policy", [input.host, input.port])}
