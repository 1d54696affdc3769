"""taskhandler-operator: binds Airflow ``@task.stub`` tasks to Lang-SDK artifacts."""

__version__ = "0.1.0"
