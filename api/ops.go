package api

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/x402-facilitator/x402-facilitator/ops"
)

// Ops is the operations overview (ops.Overview): every section is read within its own bound and
// says on its own when it could not be, so the answer is always 200.
type Ops interface {
	Overview(ctx context.Context) ops.Snapshot
}

func (s *Server) opsOverview(c echo.Context) error {
	if err := requireOperator(viewerOf(c)); err != nil {
		return s.writeError(c, nil, err)
	}
	return c.JSON(http.StatusOK, s.cfg.Ops.Overview(c.Request().Context()))
}
