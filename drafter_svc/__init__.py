"""The drafter service: any engine drafter behind tandem.v1.Drafter."""
