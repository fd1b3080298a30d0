package api

import (
	_ "embed"
	"net/http"
)

// openapiYAML is the API's OpenAPI 3 document, served at
// /api/v1/openapi.yaml; TestOpenAPIMatchesRoutes keeps it equal to the
// routes.
//
//go:embed openapi.yaml
var openapiYAML []byte

// OpenAPI returns the embedded OpenAPI 3 document.
func OpenAPI() []byte { return openapiYAML }

func (s *Server) openAPI(w http.ResponseWriter, _ *http.Request) error {
	w.Header().Set("Content-Type", "application/yaml")
	_, err := w.Write(openapiYAML)
	return err
}
