"""great-expectations data contracts: one suite per stage output, and the Parquet validator."""

from data_contracts.validate import ContractViolation, validate_parquet

__all__ = ["ContractViolation", "validate_parquet"]
