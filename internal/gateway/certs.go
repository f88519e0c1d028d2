package gateway

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/openshell-go/openshell/internal/pki"
	pkik8s "github.com/openshell-go/openshell/internal/pki/k8s"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// stringList is a repeatable, comma-splitting flag value.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error {
	for p := range strings.SplitSeq(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// RunGenerateCerts implements `openshell-gateway generate-certs`. It writes
// the CA, server and client certificates and the sandbox JWT key pair either
// into --output-dir or, in Kubernetes Secrets mode (--namespace and the
// --*-secret-name flags), into three Secrets; --jwt-only writes only the JWT
// Secret. Both modes are idempotent (complete → skip, partial → error,
// empty → generate). args excludes the subcommand name.
func RunGenerateCerts(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("openshell-gateway generate-certs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	outputDir := fs.String("output-dir", "", "directory to write the PKI bundle into (created 0700)")
	var sans stringList
	fs.Var(&sans, "server-san", "extra server certificate name or IP (repeatable, comma separated)")
	dryRun := fs.Bool("dry-run", false, "print what would be written and exit")
	namespace := fs.String("namespace", os.Getenv("POD_NAMESPACE"), "Kubernetes Secrets mode: namespace of the Secrets (default $POD_NAMESPACE)")
	serverSecret := fs.String("server-secret-name", "", "Kubernetes Secrets mode: kubernetes.io/tls Secret for the gateway server certificate")
	clientSecret := fs.String("client-secret-name", "", "Kubernetes Secrets mode: kubernetes.io/tls Secret for the client certificate (mounted into sandboxes)")
	jwtSecret := fs.String("jwt-secret-name", "", "Kubernetes Secrets mode: Opaque Secret for the sandbox JWT key pair")
	jwtOnly := fs.Bool("jwt-only", false, "Kubernetes Secrets mode: manage only the JWT Secret (TLS comes from elsewhere)")
	kubeconfig := fs.String("kubeconfig", "", "Kubernetes Secrets mode: kubeconfig file (default: in-cluster configuration)")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(stderr, "Usage: openshell-gateway generate-certs --output-dir DIR [--server-san NAME]... [--dry-run]\n")
		_, _ = fmt.Fprintf(stderr, "       openshell-gateway generate-certs [--namespace NS] --server-secret-name S --client-secret-name C --jwt-secret-name J [--server-san NAME]... [--kubeconfig FILE] [--dry-run]\n")
		_, _ = fmt.Fprintf(stderr, "       openshell-gateway generate-certs [--namespace NS] --jwt-only --jwt-secret-name J [--kubeconfig FILE] [--dry-run]\n\n")
		_, _ = fmt.Fprintf(stderr, "Writes %s under DIR,\nor Secrets (server, client: tls.crt, tls.key, ca.crt; jwt: signing.pem, public.pem, kid).\nDefault server names: %s.\n\nFlags:\n",
			strings.Join(pki.DirFiles, ", "), strings.Join(pki.DefaultServerSANs, ", "))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("generate-certs: unexpected argument %q", fs.Arg(0))
	}
	secretsMode := false
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "namespace", "server-secret-name", "client-secret-name", "jwt-secret-name", "jwt-only", "kubeconfig":
			secretsMode = true
		}
	})
	var sink pki.Sink
	ensure := func() (*pki.Report, error) { return pki.Ensure(ctx, sink, pki.Options{ServerSANs: sans}, *dryRun) }
	switch {
	case secretsMode && *outputDir != "":
		return errors.New("generate-certs: --output-dir cannot be combined with the Kubernetes Secrets flags (--namespace, --*-secret-name, --jwt-only, --kubeconfig)")
	case secretsMode:
		if *namespace == "" {
			return errors.New("generate-certs: --namespace (or POD_NAMESPACE) is required in Kubernetes Secrets mode")
		}
		if *jwtOnly && (*serverSecret != "" || *clientSecret != "") {
			return errors.New("generate-certs: --jwt-only manages only the JWT Secret; drop --server-secret-name and --client-secret-name")
		}
		if *jwtSecret == "" {
			return errors.New("generate-certs: --jwt-secret-name is required in Kubernetes Secrets mode")
		}
		if !*jwtOnly && (*serverSecret == "" || *clientSecret == "") {
			return errors.New("generate-certs: --server-secret-name and --client-secret-name are required in Kubernetes Secrets mode (or use --jwt-only)")
		}
		client, err := kubeClient(*kubeconfig)
		if err != nil {
			return fmt.Errorf("generate-certs: %w", err)
		}
		ss := &pkik8s.Secrets{
			Client: client, Namespace: *namespace,
			ServerSecretName: *serverSecret, ClientSecretName: *clientSecret, JWTSecretName: *jwtSecret,
			JWTOnly: *jwtOnly,
		}
		if err := ss.Validate(); err != nil {
			return fmt.Errorf("generate-certs: %w", err)
		}
		sink = ss
		ensure = func() (*pki.Report, error) { return pkik8s.Ensure(ctx, ss, pki.Options{ServerSANs: sans}, *dryRun) }
	case *outputDir == "":
		return errors.New("generate-certs: --output-dir is required (or --namespace and --*-secret-name for Kubernetes Secrets)")
	default:
		sink = pki.Dir{Path: *outputDir}
	}
	rep, err := ensure()
	if err != nil {
		return fmt.Errorf("generate-certs: %w", err)
	}
	switch rep.Outcome {
	case pki.Skipped:
		_, _ = fmt.Fprintf(stdout, "PKI in %s is complete; skipped generation (nothing was changed)\n", sink)
	case pki.WouldGenerate:
		_, _ = fmt.Fprintf(stdout, "dry run: would write to %s:\n", sink)
		for _, it := range rep.Items {
			_, _ = fmt.Fprintf(stdout, "  %s\n", it)
		}
		if !*jwtOnly {
			_, _ = fmt.Fprintf(stdout, "server names: %s\n", strings.Join(append(append([]string(nil), pki.DefaultServerSANs...), sans...), ", "))
		}
	case pki.Generated:
		_, _ = fmt.Fprintf(stdout, "generated PKI in %s:\n", sink)
		for _, it := range rep.Items {
			_, _ = fmt.Fprintf(stdout, "  %s\n", it)
		}
		_, _ = fmt.Fprintf(stdout, "sandbox JWT kid: %s\n", rep.KID)
	}
	return nil
}

// kubeClient connects with the kubeconfig at path, or the in-cluster
// configuration when path is empty.
func kubeClient(path string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if path != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	} else {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			err = fmt.Errorf("%w (outside a cluster, pass --kubeconfig)", err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	cfg.UserAgent = "openshell-gateway-generate-certs"
	return kubernetes.NewForConfig(cfg)
}
