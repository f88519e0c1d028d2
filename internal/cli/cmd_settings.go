package cli

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	sandboxv1 "github.com/openshell-go/openshell/api/openshell/sandbox/v1"
	openshellv1 "github.com/openshell-go/openshell/api/openshell/v1"
	"github.com/openshell-go/openshell/internal/settings"
)

// The settings commands follow OpenShell's CLI: 'settings get [NAME]
// [--global] [--json]', 'settings set|delete [NAME] --key K [--value V]
// [--global] [--yes]', over GetSandboxConfig (effective settings),
// GetGatewayConfig and UpdateConfig's setting_key.

func (a *app) newSettingsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "settings",
		Short: "Manage sandbox and global settings",
		Long: `Manage runtime settings: typed keys (see 'openshell settings get --global'
for the list) set per sandbox or gateway-wide. A key set globally wins over
the sandbox's value and cannot be set on a sandbox until it is deleted
globally.`,
		Example: `  openshell settings get my-sandbox
  openshell settings get --global
  openshell settings set --global --key providers_v2_enabled --value true --yes
  openshell settings set my-sandbox --key ocsf_json_enabled --value true
  openshell settings delete --global --key providers_v2_enabled --yes`,
		RunE: groupRunE,
	}
	cmd.AddCommand(a.newSettingsGetCmd(), a.newSettingsSetCmd(), a.newSettingsDeleteCmd())
	return cmd
}

// formatSettingValue renders a value as OpenShell's CLI does.
func formatSettingValue(v *sandboxv1.SettingValue) string {
	switch x := v.GetValue().(type) {
	case *sandboxv1.SettingValue_StringValue:
		return x.StringValue
	case *sandboxv1.SettingValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *sandboxv1.SettingValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *sandboxv1.SettingValue_BytesValue:
		return fmt.Sprintf("<bytes:%d>", len(x.BytesValue))
	}
	return "<unset>"
}

func settingScopeName(s sandboxv1.SettingScope) string {
	switch s {
	case sandboxv1.SettingScope_SETTING_SCOPE_GLOBAL:
		return "global"
	case sandboxv1.SettingScope_SETTING_SCOPE_SANDBOX:
		return "sandbox"
	}
	return "unset"
}

// parseSettingValue types raw for key from the setting registry, so that a
// typo fails before anything is sent (the gateway checks again).
func parseSettingValue(key, raw string) (*sandboxv1.SettingValue, error) {
	k, ok := settings.Lookup(key)
	if !ok || key == settings.PolicyKey {
		return nil, usagef("unknown setting key '%s'. Allowed keys: %s", key, settings.Names())
	}
	switch k.Kind {
	case settings.Bool:
		var b bool
		switch strings.ToLower(strings.TrimSpace(raw)) {
		case "true", "yes", "1":
			b = true
		case "false", "no", "0":
		default:
			return nil, usagef("invalid bool value '%s' for key '%s'; expected one of: true,false,yes,no,1,0", raw, key)
		}
		return &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BoolValue{BoolValue: b}}, nil
	case settings.Int:
		n, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
		if err != nil {
			return nil, usagef("invalid int value '%s' for key '%s'; expected base-10 integer", raw, key)
		}
		return &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_IntValue{IntValue: n}}, nil
	case settings.Bytes:
		return &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_BytesValue{BytesValue: []byte(raw)}}, nil
	}
	if len(k.Allowed) > 0 && !slices.Contains(k.Allowed, raw) {
		return nil, usagef("invalid value '%s' for key '%s'; expected one of: %s", raw, key, strings.Join(k.Allowed, ", "))
	}
	return &sandboxv1.SettingValue{Value: &sandboxv1.SettingValue_StringValue{StringValue: raw}}, nil
}

// completeSettingKeys completes --key with the registered keys.
func completeSettingKeys(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	var out []cobra.Completion
	for _, k := range settings.Registered {
		if strings.HasPrefix(k.Name, toComplete) {
			out = append(out, k.Name)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

type sandboxSettingView struct {
	Value string `json:"value"`
	Scope string `json:"scope"`
}

type sandboxSettingsView struct {
	Sandbox        string                        `json:"sandbox"`
	Workspace      string                        `json:"workspace"`
	ConfigRevision uint64                        `json:"config_revision"`
	PolicySource   string                        `json:"policy_source"`
	PolicyHash     string                        `json:"policy_hash"`
	Settings       map[string]sandboxSettingView `json:"settings"`
}

type globalSettingsView struct {
	Scope            string            `json:"scope"`
	SettingsRevision uint64            `json:"settings_revision"`
	Settings         map[string]string `json:"settings"`
}

func (a *app) newSettingsGetCmd() *cobra.Command {
	var global, asJSON bool
	cmd := &cobra.Command{
		Use:   "get [NAME]",
		Short: "Show the effective settings of a sandbox, or the global settings",
		Long: `Show every setting key of sandbox NAME with its effective value and where it
comes from: global (set gateway-wide, which wins), sandbox (set on this
sandbox) or unset (the key's default holds). --global shows the gateway-wide
values. --json is the same as -o json.`,
		Args:              argsUsage(cobra.MaximumNArgs(1)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := scopeName("settings get", args, global)
			if err != nil {
				return err
			}
			if asJSON {
				a.output = "json"
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			if global {
				return a.settingsGetGlobal(cmd.Context(), c)
			}
			return a.settingsGetSandbox(cmd.Context(), c, name)
		},
	}
	cmd.Flags().BoolVar(&global, "global", false, "show the gateway-wide settings")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (same as -o json)")
	return cmd
}

func (a *app) settingsGetSandbox(ctx context.Context, c openshellv1.OpenShellClient, name string) error {
	sb, err := a.getSandbox(ctx, name)
	if err != nil {
		return err
	}
	cfg, err := c.GetSandboxConfig(ctx, &sandboxv1.GetSandboxConfigRequest{SandboxId: sb.GetMetadata().GetId()})
	if err != nil {
		return a.rpcError(err, sandboxWhat(name))
	}
	source := "sandbox"
	if cfg.GetPolicySource() == sandboxv1.PolicySource_POLICY_SOURCE_GLOBAL {
		source = "global"
	}
	keys := sortedKeys(cfg.GetSettings())
	if a.structured() {
		v := sandboxSettingsView{Sandbox: name, Workspace: a.ws(), ConfigRevision: cfg.GetConfigRevision(),
			PolicySource: source, PolicyHash: cfg.GetPolicyHash(), Settings: map[string]sandboxSettingView{}}
		for _, k := range keys {
			s := cfg.GetSettings()[k]
			v.Settings[k] = sandboxSettingView{Value: formatSettingValue(s.GetValue()), Scope: settingScopeName(s.GetScope())}
		}
		return a.printValue(v)
	}
	w := a.stdout
	_, _ = fmt.Fprintf(w, "Sandbox:       %s\n", name)
	_, _ = fmt.Fprintf(w, "Config Rev:    %d\n", cfg.GetConfigRevision())
	_, _ = fmt.Fprintf(w, "Policy Source: %s\n", source)
	_, _ = fmt.Fprintf(w, "Policy Hash:   %s\n", cfg.GetPolicyHash())
	if len(keys) == 0 {
		_, _ = fmt.Fprintln(w, "Settings:      No settings available.")
		return nil
	}
	_, _ = fmt.Fprintln(w, "Settings:")
	for _, k := range keys {
		s := cfg.GetSettings()[k]
		_, _ = fmt.Fprintf(w, "  %s = %s (%s)\n", k, formatSettingValue(s.GetValue()), settingScopeName(s.GetScope()))
	}
	return nil
}

func (a *app) settingsGetGlobal(ctx context.Context, c openshellv1.OpenShellClient) error {
	resp, err := c.GetGatewayConfig(ctx, &sandboxv1.GetGatewayConfigRequest{})
	if err != nil {
		return a.rpcError(err, "")
	}
	keys := make([]string, 0, len(resp.GetSettings()))
	for k := range resp.GetSettings() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if a.structured() {
		v := globalSettingsView{Scope: "global", SettingsRevision: resp.GetSettingsRevision(), Settings: map[string]string{}}
		for _, k := range keys {
			v.Settings[k] = formatSettingValue(resp.GetSettings()[k])
		}
		return a.printValue(v)
	}
	w := a.stdout
	_, _ = fmt.Fprintln(w, "Scope:         global")
	_, _ = fmt.Fprintf(w, "Settings Rev:  %d\n", resp.GetSettingsRevision())
	if len(keys) == 0 {
		_, _ = fmt.Fprintln(w, "Settings:      No settings available.")
		return nil
	}
	_, _ = fmt.Fprintln(w, "Settings:")
	for _, k := range keys {
		_, _ = fmt.Fprintf(w, "  %s = %s\n", k, formatSettingValue(resp.GetSettings()[k]))
	}
	return nil
}

func (a *app) newSettingsSetCmd() *cobra.Command {
	var (
		key, value  string
		global, yes bool
	)
	cmd := &cobra.Command{
		Use:   "set [NAME] --key KEY --value VALUE",
		Short: "Set a setting on a sandbox, or gateway-wide",
		Long: `Set setting KEY to VALUE on sandbox NAME, or gateway-wide with --global.
VALUE is typed by the key: bool keys accept true/false/yes/no/1/0, string
keys with a fixed set of values accept only those. Global changes ask for
confirmation; --yes skips it (required without a terminal).`,
		Args:              argsUsage(cobra.MaximumNArgs(1)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := scopeName("settings set", args, global)
			if err != nil {
				return err
			}
			if key == "" || !cmd.Flags().Changed("value") {
				return usagef("--key and --value are required")
			}
			sv, err := parseSettingValue(key, value)
			if err != nil {
				return err
			}
			if global {
				if err := a.confirmGlobal(yes, fmt.Sprintf("Setting '%s' globally will disable sandbox-level management for this key.", key), "global setting updates require confirmation"); err != nil {
					return err
				}
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.UpdateConfig(cmd.Context(), &openshellv1.UpdateConfigRequest{Name: name, SettingKey: key, SettingValue: sv, Global: global, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, scopeWhat(name, global))
			}
			if global {
				_, _ = fmt.Fprintf(a.stdout, "Set global setting %s=%s (revision %d)\n", key, value, resp.GetSettingsRevision())
			} else {
				_, _ = fmt.Fprintf(a.stdout, "Set sandbox setting %s=%s for %s (revision %d)\n", key, value, name, resp.GetSettingsRevision())
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&key, "key", "", "setting key (required)")
	f.StringVar(&value, "value", "", "setting value (required)")
	_ = cmd.RegisterFlagCompletionFunc("key", completeSettingKeys)
	f.BoolVar(&global, "global", false, "set the gateway-wide value")
	f.BoolVar(&yes, "yes", false, "skip the confirmation prompt of a global change")
	return cmd
}

func (a *app) newSettingsDeleteCmd() *cobra.Command {
	var (
		key         string
		global, yes bool
	)
	cmd := &cobra.Command{
		Use:   "delete [NAME] --key KEY",
		Short: "Delete a setting of a sandbox, or gateway-wide",
		Long: `Delete setting KEY of sandbox NAME, or gateway-wide with --global; the
key's default (or the other scope's value) holds again. Global deletes ask for
confirmation; --yes skips it (required without a terminal).`,
		Args:              argsUsage(cobra.MaximumNArgs(1)),
		ValidArgsFunction: a.completeSandboxes,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, err := scopeName("settings delete", args, global)
			if err != nil {
				return err
			}
			if key == "" {
				return usagef("--key is required")
			}
			if global {
				return a.deleteGlobalSetting(cmd.Context(), key, yes)
			}
			c, err := a.gateway()
			if err != nil {
				return err
			}
			resp, err := c.UpdateConfig(cmd.Context(), &openshellv1.UpdateConfigRequest{Name: name, SettingKey: key, DeleteSetting: true, Workspace: a.ws()})
			if err != nil {
				return a.rpcError(err, sandboxWhat(name))
			}
			if resp.GetDeleted() {
				_, _ = fmt.Fprintf(a.stdout, "Deleted sandbox setting %s for %s (revision %d)\n", key, name, resp.GetSettingsRevision())
			} else {
				_, _ = fmt.Fprintf(a.stdout, "Sandbox setting %s not found for %s\n", key, name)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&key, "key", "", "setting key (required)")
	_ = cmd.RegisterFlagCompletionFunc("key", completeSettingKeys)
	f.BoolVar(&global, "global", false, "delete the gateway-wide value")
	f.BoolVar(&yes, "yes", false, "skip the confirmation prompt of a global delete")
	return cmd
}

// deleteGlobalSetting deletes key at global scope ('policy' removes the
// global policy).
func (a *app) deleteGlobalSetting(ctx context.Context, key string, yes bool) error {
	if err := a.confirmGlobal(yes, fmt.Sprintf("Deleting global setting '%s' re-enables sandbox-level management for this key.", key), "global setting deletes require confirmation"); err != nil {
		return err
	}
	c, err := a.gateway()
	if err != nil {
		return err
	}
	resp, err := c.UpdateConfig(ctx, &openshellv1.UpdateConfigRequest{SettingKey: key, DeleteSetting: true, Global: true, Workspace: a.ws()})
	if err != nil {
		return a.rpcError(err, "")
	}
	if resp.GetDeleted() {
		_, _ = fmt.Fprintf(a.stdout, "Deleted global setting %s (revision %d)\n", key, resp.GetSettingsRevision())
	} else {
		_, _ = fmt.Fprintf(a.stdout, "Global setting %s not found\n", key)
	}
	return nil
}
