"""The API every capability's ``api.py`` plugs into: the one router (``urls``), team-scoped base classes
(``base``), JSON errors (``errors``), the JSON parser (``parsers``) and the health endpoint (``health``)."""
