package kubernetes_test

import (
	"context"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	typedauthn "k8s.io/client-go/kubernetes/typed/authentication/v1"
)

// reviewRewriter is a real clientset whose TokenReviews answer with fixed
// audiences: the only way to see a reviewer authenticate a token for an
// audience the authenticator did not ask for.
type reviewRewriter struct {
	k8s.Interface
	audiences []string
}

func (r reviewRewriter) AuthenticationV1() typedauthn.AuthenticationV1Interface {
	return authnRewriter{r.Interface.AuthenticationV1(), r.audiences}
}

type authnRewriter struct {
	typedauthn.AuthenticationV1Interface
	audiences []string
}

func (a authnRewriter) TokenReviews() typedauthn.TokenReviewInterface {
	return reviewsRewriter{a.AuthenticationV1Interface.TokenReviews(), a.audiences}
}

type reviewsRewriter struct {
	typedauthn.TokenReviewInterface
	audiences []string
}

func (r reviewsRewriter) Create(ctx context.Context, tr *authenticationv1.TokenReview, opts metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	got, err := r.TokenReviewInterface.Create(ctx, tr, opts)
	if err == nil {
		got.Status.Audiences = r.audiences
	}
	return got, err
}
