"""Pure readers of what Airflow writes: serialized Dags and their stub arguments (no I/O)."""
