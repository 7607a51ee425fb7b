package api

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// openAPIDocument is the OpenAPI 3.1 description of every route New registers, served at
// GET /openapi.json. openapi_test.go checks it against the routes, the handlers' statuses and
// the Go types of the bodies, so a change to any of them fails until the document follows.
//
//go:embed openapi.json
var openAPIDocument []byte

// OpenAPI returns the OpenAPI 3.1 document (JSON) that GET /openapi.json serves.
func OpenAPI() []byte { return append([]byte(nil), openAPIDocument...) }

func (s *Server) openAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, openAPIDocument)
}
