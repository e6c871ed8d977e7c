"""Operations: typed settings, metrics, logging, systemd integration."""
