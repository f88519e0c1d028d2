package charttest

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// TestCredentialsKEKSecret: by default the gateway takes its credentials
// key-encryption key from the Secret <fullname>-credentials-kek and may get
// that one Secret and create Secrets; createSecret=false drops create;
// secret=false renders neither the variables nor the Role.
func TestCredentialsKEKSecret(t *testing.T) {
	getRule := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"openshell-credentials-kek"}, Verbs: []string{"get"}}
	createRule := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}}
	kekEnv := func(t *testing.T, values string) (secret, key string) {
		t.Helper()
		var sts appsv1.StatefulSet
		get(t, mustRender(t, values), "StatefulSet", "openshell", &sts)
		c := sts.Spec.Template.Spec.Containers[0]
		if e := env(c, "OPENSHELL_CREDENTIALS_KEK_SECRET"); e != nil {
			secret = e.Value
		}
		if e := env(c, "OPENSHELL_CREDENTIALS_KEK_SECRET_KEY"); e != nil {
			key = e.Value
		}
		return secret, key
	}

	if s, k := kekEnv(t, ""); s != "openshell/openshell-credentials-kek" || k != "kek" {
		t.Errorf("default env = %q, %q; want openshell/openshell-credentials-kek, kek", s, k)
	}
	objs := mustRender(t, "")
	if diff := cmp.Diff([]rbacv1.PolicyRule{getRule, createRule}, rules(t, objs, "Role", "openshell-credentials-kek")); diff != "" {
		t.Errorf("default Role rules (-want +got):\n%s", diff)
	}
	var rb rbacv1.RoleBinding
	get(t, objs, "RoleBinding", "openshell-credentials-kek", &rb)
	if diff := cmp.Diff([]rbacv1.Subject{{Kind: "ServiceAccount", Name: "openshell", Namespace: "openshell"}}, rb.Subjects); diff != "" || rb.RoleRef.Name != "openshell-credentials-kek" {
		t.Errorf("RoleBinding (-want +got):\n%s roleRef %+v", diff, rb.RoleRef)
	}

	custom := "server: {credentialsKEK: {secretName: my-kek, secretKey: key1, createSecret: false}}"
	if s, k := kekEnv(t, custom); s != "openshell/my-kek" || k != "key1" {
		t.Errorf("custom env = %q, %q", s, k)
	}
	getMine := getRule
	getMine.ResourceNames = []string{"my-kek"}
	if diff := cmp.Diff([]rbacv1.PolicyRule{getMine}, rules(t, mustRender(t, custom), "Role", "openshell-credentials-kek")); diff != "" {
		t.Errorf("createSecret=false Role rules (-want +got):\n%s", diff)
	}

	off := "server: {credentialsKEK: {secret: false}}"
	if s, k := kekEnv(t, off); s != "" || k != "" {
		t.Errorf("secret=false env = %q, %q; want none", s, k)
	}
	if has(mustRender(t, off), "Role", "openshell-credentials-kek") {
		t.Error("secret=false renders the credentials-kek Role")
	}

	for _, bad := range []string{"server: {credentialsKEK: {secret: \"yes\"}}", "server: {credentialsKEK: {secretKey: \"\"}}"} {
		if _, err := render(t, bad); err == nil || !strings.Contains(err.Error(), "server.credentialsKEK") {
			t.Errorf("render(%s) = %v; want an error naming server.credentialsKEK", bad, err)
		}
	}
}
